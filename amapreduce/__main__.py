"""`python -m amapreduce ...`: the same command line as the `amapreduce` executable."""

from amapreduce.cli.app import run

if __name__ == "__main__":
    run()
