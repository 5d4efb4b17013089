"""python -m verification.judge HISTORY_DIR ...: the same as warren-verify."""
import sys

from warren.verification.judge.cli import main

sys.exit(main())
