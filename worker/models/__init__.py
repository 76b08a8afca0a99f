"""Models: the architecture registry and one module per family (families/), the shared layers,
configs, weight loading, FP8 weights, tokenizer helpers, the alias registry (docs/models.md)."""
