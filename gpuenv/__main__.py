from gpuenv.cli import main

raise SystemExit(main())
