import sys

from plaita.cli.main import main

sys.exit(main())
