"""`PushError`, the one error of every weight push backend (the rule it reports: train/push/__init__.py)."""

from __future__ import annotations


class PushError(RuntimeError):
    """A weight push that failed; the engines were aborted and every rank released before it was raised."""

    def __init__(self, backend: str, phase: str, rank: int, parameter: str | None, cause: BaseException | str,
                 mixed: int = 0):
        self.backend, self.phase, self.rank, self.parameter, self.mixed = backend, phase, rank, parameter, mixed
        why = cause if isinstance(cause, str) else f"{type(cause).__name__}: {str(cause).strip()[:500]}"
        state = (f"the engines hold new weights for {mixed} names and the previous ones elsewhere until the next push"
                 if mixed else "the engines serve the previous weights")
        super().__init__(f"weight push ({backend}) failed at {phase} on learner rank {rank}"
                         f"{f', parameter {parameter}' if parameter else ''}: {why}; every engine was aborted and "
                         f"resumed, {state}")
