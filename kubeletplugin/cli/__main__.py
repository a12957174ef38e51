import sys

from kubeletplugin.cli import main

sys.exit(main())
