"""Entry point for spark-submit (a file, not a module, as spark-submit wants):

    spark-submit --master spark://host:7077 --py-files warren-verify.zip \
        verification/judge/spark_main.py HISTORY_DIR [--out DIR]

The zip comes from `python -m verification.judge.session DIR`.
"""
import sys

from warren.verification.judge.cli import main

if __name__ == "__main__":
    sys.exit(main())
