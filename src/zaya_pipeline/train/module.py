"""The LightningModule: next-token cross-entropy plus the routers' auxiliary losses."""

from __future__ import annotations

import lightning as L
import torch
import torch.nn.functional as F

from zaya_pipeline.config import ModelConfig, TrainConfig
from zaya_pipeline.model.transformer import LMOutput, ZayaLM
from zaya_pipeline.train.optim import build_optimizer, build_scheduler


def lm_loss(logits_BTV: torch.Tensor, labels_BT: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy in nats, computed in fp32 whatever the training precision."""
    return F.cross_entropy(logits_BTV.flatten(0, 1).float(), labels_BT.flatten())


class ZayaLitModule(L.LightningModule):
    def __init__(self, model_cfg: ModelConfig, train_cfg: TrainConfig):
        super().__init__()
        self.model_cfg = model_cfg
        self.train_cfg = train_cfg
        self.model = ZayaLM(model_cfg)

    def forward(self, input_ids_BT: torch.Tensor) -> LMOutput:
        return self.model(input_ids_BT)

    def training_step(self, batch: dict, batch_idx: int) -> dict:
        out = self.model(batch["input_ids"])
        ce = lm_loss(out.logits, batch["labels"])
        # The extra entries feed the telemetry callback (train/callbacks.py); only "loss" is backpropagated.
        return {
            "loss": ce + out.aux_loss,
            "ce": ce.detach(),
            "aux": out.aux_loss.detach(),
            "expert_counts_LE": out.expert_counts_LE,
            "dropped_slots": out.dropped_slots.detach(),
        }

    def validation_step(self, batch: dict, batch_idx: int) -> dict:
        ce = lm_loss(self.model(batch["input_ids"]).logits, batch["labels"])
        return {"ce": ce, "tokens": batch["labels"].numel()}

    def optimizer_step(self, *args, **kwargs) -> None:
        super().optimizer_step(*args, **kwargs)
        self.model.update_router_biases()  # once per optimizer step, after the weights moved

    def configure_optimizers(self) -> dict:
        optimizer = build_optimizer(self.model, self.train_cfg.optim)
        scheduler = build_scheduler(optimizer, self.train_cfg.optim, self.train_cfg.max_steps)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}
