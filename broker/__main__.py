from broker.server import main

raise SystemExit(main())
