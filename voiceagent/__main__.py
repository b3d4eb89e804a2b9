import sys

from voiceagent.cli import main

sys.exit(main())
