from zeal_edge.cli import main

raise SystemExit(main())
