"""Model layer: the smolagents `Model` seam, scripted (simulated) models and the test guard."""
