"""The worker's front end: the Generator contract, tokenization, the supervised scheduler process,
Results."""
