// Package pgcluster starts and stops throwaway PostgreSQL servers for tests,
// `relay-dev demo` and `relay-dev bench`.
//
// Start tries, in order: a server built from the local PostgreSQL binaries
// (initdb and postgres, found on PATH or under /usr/lib/postgresql/*/bin) in
// a temporary directory, and then a container through testcontainers-go when
// a Docker engine answers. Options.BinDir, or else the RELAY_TEST_PG_BIN or
// RELAY_TEST_PG_MAJOR environment variable, picks the binaries instead (one
// major's, say: MajorBinDir); such a request that cannot be met is an
// error, never a fallback. When neither is possible it returns an error that
// says what was tried. Every server it starts has wal_level=logical and room
// for replication slots and WAL senders, so both of Relay's readers work
// against it.
//
// PostgreSQL refuses to run as root. When the calling process is root, the
// local server's files belong to the "postgres" OS user and initdb and
// postgres run as that user.
package pgcluster

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"time"
)

// Kind tells how a Cluster was started.
type Kind string

const (
	// KindExternal is a server given by URL; Stop leaves it running.
	KindExternal Kind = "external"
	// KindLocal is a server started from the local PostgreSQL binaries.
	KindLocal Kind = "local"
	// KindContainer is a server in a container started by testcontainers-go.
	KindContainer Kind = "container"
)

// Options tune a started server. The zero value is ready to use.
type Options struct {
	// Settings are extra postgresql.conf settings, name to value. They
	// override the defaults Start sets.
	Settings map[string]string
	// Durable keeps fsync on. By default a throwaway server runs with
	// fsync=off: it lives in a temporary directory and is never used after
	// an operating-system crash, and tests run much faster without it.
	Durable bool
	// BinDir is a directory holding initdb and postgres to start the
	// server from. Empty means RELAY_TEST_PG_BIN, RELAY_TEST_PG_MAJOR, or
	// else the binaries found on PATH or under /usr/lib/postgresql.
	BinDir string
}

// Cluster is a running PostgreSQL server.
type Cluster struct {
	kind Kind
	// url is a superuser connection URL to the "postgres" database.
	url  string
	stop func(context.Context) error
	// restart is nil for kinds that cannot be restarted by this package.
	restart func(ctx context.Context, immediate bool) error
	dataDir string
	// local is the server of a KindLocal cluster.
	local *localServer
}

// Kind tells how the cluster was started.
func (c *Cluster) Kind() Kind { return c.kind }

// URL is a superuser connection URL to the cluster's "postgres" database.
func (c *Cluster) URL() string { return c.url }

// DataDir is the server's data directory, empty when it is not local.
func (c *Cluster) DataDir() string { return c.dataDir }

// DatabaseURL returns the cluster's URL with the database name replaced.
func (c *Cluster) DatabaseURL(database string) string {
	u, err := url.Parse(c.url)
	if err != nil {
		return c.url
	}
	u.Path = "/" + database
	return u.String()
}

// Stop shuts the server down and removes its files. It is safe to call more
// than once.
func (c *Cluster) Stop(ctx context.Context) error {
	if c.stop == nil {
		return nil
	}
	stop := c.stop
	c.stop = nil
	return stop(ctx)
}

// Restart stops and starts the server again with the same data directory and
// port. With immediate set it stops the server as a crash would (pg_ctl's
// immediate mode); otherwise it lets sessions finish their shutdown.
func (c *Cluster) Restart(ctx context.Context, immediate bool) error {
	if c.restart == nil {
		return fmt.Errorf("pgcluster: a %s cluster cannot be restarted", c.kind)
	}
	return c.restart(ctx, immediate)
}

// External wraps a server the caller runs. Stop does nothing.
func External(databaseURL string) *Cluster {
	return &Cluster{kind: KindExternal, url: databaseURL}
}

// ErrNoPostgres is returned by Start when no way to run PostgreSQL was found.
var ErrNoPostgres = errors.New("pgcluster: no way to start PostgreSQL")

// Start starts a throwaway server: from the local binaries when they are
// installed, else in a Docker container when Docker answers.
func Start(ctx context.Context, opts Options) (*Cluster, error) {
	if bin, requested, err := requestedBinaries(opts); requested {
		if err != nil {
			return nil, err
		}
		return startLocal(ctx, bin, opts)
	}
	bin, localErr := findBinaries()
	if localErr == nil {
		return startLocal(ctx, bin, opts)
	}
	if dockerErr := dockerAvailable(ctx); dockerErr == nil {
		return startContainer(ctx, opts)
	} else {
		return nil, fmt.Errorf("%w: %v; %v. Install PostgreSQL (for example `apt-get install -y postgresql`), start Docker, or point RELAY_TEST_DATABASE_URL at a server with wal_level=logical",
			ErrNoPostgres, localErr, dockerErr)
	}
}

// settings returns the postgresql.conf settings for a throwaway server.
func settings(opts Options) map[string]string {
	s := map[string]string{
		"wal_level":             "logical",
		"max_replication_slots": "32",
		"max_wal_senders":       "32",
		"max_connections":       "300",
		"fsync":                 "off",
		"full_page_writes":      "off",
		"synchronous_commit":    "on",
		"log_min_messages":      "warning",
	}
	if opts.Durable {
		s["fsync"] = "on"
		s["full_page_writes"] = "on"
	}
	for k, v := range opts.Settings {
		s[k] = v
	}
	return s
}

// waitReady polls until a connection attempt would succeed or ctx ends.
func waitReady(ctx context.Context, ping func(context.Context) error) error {
	var last error
	for {
		pingCtx, cancel := context.WithTimeout(ctx, 2*time.Second)
		last = ping(pingCtx)
		cancel()
		if last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("pgcluster: server did not accept connections: %w", errors.Join(ctx.Err(), last))
		case <-time.After(50 * time.Millisecond):
		}
	}
}
