"""amapreduce.memory."""
