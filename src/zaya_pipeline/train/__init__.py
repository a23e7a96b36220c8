"""Training: LightningModule, data module, callbacks, optimizer and schedule."""
