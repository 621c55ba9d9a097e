"""Training data: SFT chat records (converters, rendering, the mix, rewrites) and RL problems (curation,
verification)."""
