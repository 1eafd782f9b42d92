import sys

from ninfer.gateway.cli.main import main

sys.exit(main())
