"""Graders shared by eval (scores) and RL (rewards): math with math-verify; multiple choice and BFCL later."""
