from waddle.cli.main import main

raise SystemExit(main())
