"""python -m kilo_rules"""

from .cli import main

raise SystemExit(main())
