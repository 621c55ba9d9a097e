"""The GRPO-RoC against GRPO experiment (`rstar2 train ablation`) and its held-out probe."""
