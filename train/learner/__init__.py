"""The learner side of RL and SFT: the torch model learner, the `Learner` protocol the RL step drives, its
backends (this process, a Ray group of FSDP ranks), the policy update, and the one function that picks them."""
