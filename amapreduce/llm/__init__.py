"""Model layer: the smolagents `Model` seam, usage metering and the test guard.

Simulated (scripted) models are not here: they live in `amapreduce.testing`, out of reach of
product code.
"""
