from leveret.cli import main

raise SystemExit(main())
