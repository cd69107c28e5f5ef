import sys

from spmdsim.cli import main

sys.exit(main())
