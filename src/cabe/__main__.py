import sys

from cabe.cli import main

sys.exit(main())
