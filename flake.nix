{
  description = "cortex-recipes: a development shell per journey, built from uv.lock";

  # Every input is pinned in flake.lock (rev + narHash); `ci/nix_check.py` fails on an
  # input that is not. Refresh with `nix flake update` on a networked machine.
  inputs = {
    nixpkgs.url = "github:NixOS/nixpkgs/nixos-unstable";
    pyproject-nix = {
      url = "github:pyproject-nix/pyproject.nix";
      inputs.nixpkgs.follows = "nixpkgs";
    };
    uv2nix = {
      url = "github:pyproject-nix/uv2nix";
      inputs.nixpkgs.follows = "nixpkgs";
      inputs.pyproject-nix.follows = "pyproject-nix";
    };
    pyproject-build-systems = {
      url = "github:pyproject-nix/build-system-pkgs";
      inputs.nixpkgs.follows = "nixpkgs";
      inputs.pyproject-nix.follows = "pyproject-nix";
      inputs.uv2nix.follows = "uv2nix";
    };
  };

  outputs =
    { self, nixpkgs, pyproject-nix, uv2nix, pyproject-build-systems }:
    let
      inherit (nixpkgs) lib;
      systems = [ "x86_64-linux" "aarch64-linux" ];
      forSystems = f: builtins.listToAttrs (map (system: { name = system; value = f system; }) systems);

      # The one place that names the journeys, their extras and smoke commands.
      journeys = builtins.filter (j: j.status == "landed")
        (builtins.fromTOML (builtins.readFile ./journeys.toml)).journey;

      # A journey's shell asks for its extra plus the extras that extra names through
      # self-references (`opd = ["cortex-recipes[sft]"]`, `sft = ["cortex-recipes[local]", ...]`),
      # read from pyproject.toml, plus `tools` (pytest, hypothesis, ruff, hadolint). Never
      # `dev`, which is every journey at once.
      optionalDependencies = (builtins.fromTOML (builtins.readFile ./pyproject.toml)).project.optional-dependencies;
      selfExtras =
        extra:
        builtins.concatMap (
          requirement:
          let
            m = builtins.match "cortex-recipes\\[([^]]*)].*" requirement;
          in
          if m == null then
            [ ]
          else
            map (builtins.replaceStrings [ " " ] [ "" ]) (
              builtins.filter builtins.isString (builtins.split "," (builtins.head m))
            )
        ) optionalDependencies.${extra};
      closeExtras =
        extras:
        let
          next = lib.unique (extras ++ builtins.concatMap selfExtras extras);
        in
        if builtins.length next == builtins.length extras then extras else closeExtras next;
      toolsExtra = "tools";
      extrasFor =
        journeyExtras:
        builtins.sort builtins.lessThan (closeExtras (lib.unique ([ "local" ] ++ journeyExtras ++ [ toolsExtra ])));

      workspace = uv2nix.lib.workspace.loadWorkspace { workspaceRoot = ./.; };
      overlay = workspace.mkPyprojectOverlay { sourcePreference = "wheel"; };
      # This repository editable: edits under src/ show without a rebuild. `$REPO_ROOT` is
      # expanded when Python starts (the shellHook sets it).
      editableOverlay = workspace.mkEditablePyprojectOverlay { root = "$REPO_ROOT"; };

      # uv.lock has no build systems and no native libraries, so the packages that need them
      # get them here (uv2nix's overriding docs: resolveBuildSystem for sdists, buildInputs and
      # autoPatchelf settings for wheels).
      overridesFor =
        pkgs:
        final: prev:
        let
          sitePackages = final.python.sitePackages;
          # Locked with an sdist only (no wheel): built from source with setuptools.
          # llama-cpp-python, the only other sdist-only package in uv.lock, is dropped from
          # the resolution ([tool.uv] override-dependencies) and never built.
          sdistBuildSystems = {
            pycosat = { setuptools = [ ]; };
            cellpylib = { setuptools = [ ]; };
            zss = { setuptools = [ ]; };
          };
          sdistOverrides = builtins.mapAttrs (
            name: spec:
            prev.${name}.overrideAttrs (old: {
              nativeBuildInputs = (old.nativeBuildInputs or [ ]) ++ final.resolveBuildSystem spec;
            })
          ) sdistBuildSystems;

          # PyPI's CUDA torch and the nvidia-* wheels. Each wheel is its own store path, so the
          # relative RPATHs (`$ORIGIN/../../nvidia/...`) point nowhere: autoPatchelf is given the
          # library folders of the wheels each one links (`libsFrom`). The driver library
          # (libcuda.so.1) is not a wheel: it comes from the host at run time
          # (/run/opengl-driver/lib through autoAddDriverRunpath on NixOS, LD_LIBRARY_PATH
          # elsewhere). The lists are the `readelf -d` NEEDED entries of the locked wheels that
          # the wheel itself does not ship (docs/reproducibility.md#nix-shells).
          cudaWheels = {
            torch = {
              libsFrom = [
                "nvidia-cublas"
                "nvidia-cuda-cupti"
                "nvidia-cuda-nvrtc"
                "nvidia-cuda-runtime"
                "nvidia-cudnn-cu13"
                "nvidia-cufft"
                "nvidia-cufile"
                "nvidia-curand"
                "nvidia-cusolver"
                "nvidia-cusparse"
                "nvidia-cusparselt-cu13"
                "nvidia-nccl-cu13"
                "nvidia-nvjitlink"
                "nvidia-nvshmem-cu13"
                "nvidia-nvtx"
              ];
              ignoreMissing = [ "libcuda.so.1" ];
            };
            nvidia-cusolver.libsFrom = [ "nvidia-cublas" "nvidia-cusparse" "nvidia-nvjitlink" ];
            nvidia-cusparse.libsFrom = [ "nvidia-nvjitlink" ];
            # GPUDirect Storage over RDMA: libibverbs, libmlx5 and librdmacm.
            nvidia-cufile.buildInputs = [ pkgs.rdma-core ];
            # Optional multi-node transports and bootstraps, loaded only when selected.
            nvidia-nvshmem-cu13.ignoreMissing = [
              "libfabric.so.1"
              "libmlx5.so.1"
              "libmpi.so.40"
              "liboshmem.so.40"
              "libpmix.so.2"
              "libucp.so.0"
              "libucs.so.0"
            ];
          };
          cudaOverrides = builtins.mapAttrs (
            name: fix:
            prev.${name}.overrideAttrs (old: {
              nativeBuildInputs = (old.nativeBuildInputs or [ ]) ++ [ pkgs.autoAddDriverRunpath ];
              buildInputs = (old.buildInputs or [ ]) ++ (fix.buildInputs or [ ]);
              autoPatchelfIgnoreMissingDeps =
                (old.autoPatchelfIgnoreMissingDeps or [ ]) ++ (fix.ignoreMissing or [ ]);
              preFixup =
                (old.preFixup or "")
                + lib.concatMapStrings (
                  wheel: "addAutoPatchelfSearchPath ${final.${wheel}}/${sitePackages}/nvidia\n"
                ) (fix.libsFrom or [ ]);
            })
          ) cudaWheels;
        in
        sdistOverrides
        // cudaOverrides
        // {
          # Hatchling needs `editables` for the editable build (PEP 660).
          cortex-recipes = prev.cortex-recipes.overrideAttrs (old: {
            src = lib.fileset.toSource {
              root = old.src;
              fileset = lib.fileset.unions [
                (old.src + "/pyproject.toml")
                (old.src + "/README.md")
                (old.src + "/src/cortex_recipes/__init__.py")
              ];
            };
            nativeBuildInputs = (old.nativeBuildInputs or [ ]) ++ final.resolveBuildSystem { editables = [ ]; };
          });
        };

      shellsFor =
        system:
        let
          pkgs = nixpkgs.legacyPackages.${system};
          python = pkgs.python311;
          pythonSet =
            (pkgs.callPackage pyproject-nix.build.packages { inherit python; }).overrideScope
              (lib.composeManyExtensions [
                pyproject-build-systems.overlays.default
                overlay
                editableOverlay
                (overridesFor pkgs)
              ]);
          # Binaries the journey READMEs use besides Python. uv is a binary here, not a
          # Python module: inside a shell the commands are plain `python -m ...` and `pytest`.
          tools = [ pkgs.uv pkgs.git pkgs.procps ];
          envFor =
            name: extras:
            pythonSet.mkVirtualEnv "cortex-recipes-${name}" { cortex-recipes = extras; };
          shellFor =
            name: extras:
            pkgs.mkShell {
              packages = [ (envFor name extras) ] ++ tools;
              env = {
                UV_NO_SYNC = "1";
                UV_PYTHON = python.interpreter;
                UV_PYTHON_DOWNLOADS = "never";
                CORTEX_JOURNEY = name;
                CORTEX_RECIPES_EXTRAS = lib.concatStringsSep "," extras;
              };
              # Undo nixpkgs' PYTHONPATH propagation; the repository root stays importable
              # (the journeys live in recipes/, which is not part of the wheel).
              shellHook = ''
                export REPO_ROOT="$(git rev-parse --show-toplevel 2>/dev/null || pwd)"
                export PYTHONPATH="$REPO_ROOT"
              '';
            };
          perJourney = builtins.listToAttrs (
            map (j: {
              name = j.name;
              value = shellFor j.name (extrasFor [ j.extra ]);
            }) journeys
          );
        in
        perJourney // { default = shellFor "default" (extrasFor (map (j: j.extra) journeys)); };
    in
    {
      devShells = forSystems shellsFor;
      journeys = map (j: { inherit (j) name extra entry_point smoke; }) journeys;
    };
}
