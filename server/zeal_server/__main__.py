from zeal_server.cli import main

raise SystemExit(main())
