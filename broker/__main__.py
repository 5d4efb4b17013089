from warren.broker.node.server import main

raise SystemExit(main())
