import sys

from fuselet_build.cli import main

sys.exit(main())
