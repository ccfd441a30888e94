from fusewise.cli import main

raise SystemExit(main())
