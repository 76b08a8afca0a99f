"""Models: config, decoder, weight loading (loader), tokenizer helpers, the alias registry."""
