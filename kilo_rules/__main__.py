"""python -m kilo_rules"""

from kilo_rules.tools.cli import main

raise SystemExit(main())
