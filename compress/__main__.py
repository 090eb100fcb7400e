from compress.cli.main import main

raise SystemExit(main())
