"""`python -m quantscan` is the same program as the `quantscan` console script."""

from quantscan.cli import main

raise SystemExit(main())
