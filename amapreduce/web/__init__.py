"""amapreduce.web."""
