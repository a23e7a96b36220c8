"""Data stages: corpus preparation, datatrove curation, tokenizer training, token shards and loader."""
