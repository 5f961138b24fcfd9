import sys

from tightfit.cli.main import main

sys.exit(main())
