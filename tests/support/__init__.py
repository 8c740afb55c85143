"""What the tests share: bitwise comparison and the plain-PyTorch reference tree (bitwise), a training
job run as real processes (train_job, started by jobs)."""
