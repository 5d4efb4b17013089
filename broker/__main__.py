from warren.broker.node.launch import main

raise SystemExit(main())
