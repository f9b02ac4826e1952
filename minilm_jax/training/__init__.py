"""What every training run shares: the training loop and the checks before a run (`loop`), the
train state, optimizer and learning-rate schedule (`train_state`), the jitted programs a process
builds once and reuses across its runs (`reuse`), and metrics files (`metrics`)."""
