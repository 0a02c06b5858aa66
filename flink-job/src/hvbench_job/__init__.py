"""hvbench workload core: traffic data, LSTM flow forecaster and A* router.

Plain Python with no streaming code, so that every part can be tested on its own and used
unchanged by the Flink job.
"""
