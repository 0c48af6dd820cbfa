from leveret.perf import main

raise SystemExit(main())
