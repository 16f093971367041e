import sys

from commdebug.cli import main

sys.exit(main())
