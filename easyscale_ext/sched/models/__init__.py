"""What the simulator simulates, as the measured traces describe it; no policy, no event loop.

    traces       where the trace files are (--data, $EASYSCALE_SCHED_DATA, else the package's data/), a CSV reader
    profile      step time of an application per placement, interpolated from its measured profile
    efficiency   gradient noise over training, and the statistical efficiency of a batch size
    throughput   Pollux's throughput model and its fit to observed step times
    goodput      throughput times efficiency; the batch configuration of best goodput
    application  a profiled application: its profiles per GPU type, its noise, its length
    workload     job specs: reading the Pollux/Sia/EasyScale workloads and the Philly trace, drawing workloads
    cluster      nodes of GPUs of one type each, parsed from COUNTxGPUS[:TYPE],...
    virtual_workers  a step's time with D virtual workers spread by speed over GPUs of one or several types
    job          jobs as the simulator advances them (trace jobs, profiled jobs, EasyScale's virtual workers)
"""
