"""amapreduce.table."""
