"""amapreduce.evaluation."""
