"""amapreduce.agents."""
