import sys

from plaita.cli import main

sys.exit(main())
