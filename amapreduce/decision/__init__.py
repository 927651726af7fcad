"""amapreduce.decision."""
