"""The `easyscale` command: demo, run, scale, simulate, workload, bench, smoke (and, with Ray, cluster).

The top layer: it may import every other; each command imports what it needs when it runs, so that
`easyscale --help` and `easyscale simulate` load no torch.
"""
