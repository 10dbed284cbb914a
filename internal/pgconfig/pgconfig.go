// Package pgconfig turns Relay's connection settings into a PostgreSQL
// connection, and keeps passwords out of everything it prints.
//
// The URL comes from --database-url, else RELAY_DATABASE_URL, else the
// standard libpq variables (PGHOST, PGPORT, PGUSER, PGPASSWORD, PGDATABASE,
// PGSSLMODE, ...), which pgx reads when the URL is empty.
package pgconfig

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// EnvURL is the environment variable read when no URL flag is given.
const EnvURL = "RELAY_DATABASE_URL"

const mask = "xxxxx"

// Redact returns connString with any password replaced, for logs and
// messages. It handles URLs and key=value strings, valid or not.
func Redact(connString string) string {
	out := connString
	for _, pw := range passwords(connString) {
		out = strings.ReplaceAll(out, pw, mask)
	}
	return out
}

var (
	urlUserinfo = regexp.MustCompile(`^[a-zA-Z][a-zA-Z0-9+.-]*://[^/@?#]*?:([^@]*)@`)
	kvPassword  = regexp.MustCompile(`(?i)\b(?:ssl)?password\s*=\s*('(?:[^'\\]|\\.)*'|[^\s&]*)`)
)

// passwords finds every password-like value in connString, including ones
// in a string too broken to parse.
func passwords(connString string) []string {
	var out []string
	add := func(s string) {
		s = strings.Trim(s, "'")
		if s != "" && s != mask {
			out = append(out, s)
			if dec, err := url.QueryUnescape(s); err == nil && dec != s {
				out = append(out, dec)
			}
		}
	}
	if m := urlUserinfo.FindStringSubmatch(connString); m != nil {
		add(m[1])
	}
	for _, m := range kvPassword.FindAllStringSubmatch(connString, -1) {
		add(m[1])
	}
	if u, err := url.Parse(connString); err == nil && u.User != nil {
		if pw, ok := u.User.Password(); ok {
			add(pw)
		}
	}
	return out
}

// Scrub is err's message with every password from connString removed.
func Scrub(err error, connString string) string {
	msg := err.Error()
	for _, pw := range passwords(connString) {
		msg = strings.ReplaceAll(msg, pw, mask)
	}
	return msg
}

// Error is a connection failure whose message holds no password.
type Error struct {
	msg string
	err error
}

func (e *Error) Error() string { return e.msg }
func (e *Error) Unwrap() error { return e.err }

// Wrap is err, a failure to reach or use the server, as one line that
// starts with what and holds no password; errors.Is and errors.As see err.
func Wrap(err error, connString, what string) error {
	return &Error{msg: what + ": " + dedupeLines(Scrub(err, connString)), err: err}
}

// Refused reports whether err carries an answer of the server that asking
// again will not change: the login refused (SQLSTATE class 28: a wrong
// password, no pg_hba.conf entry for the user), no such database (3D000),
// or a statement refused for a missing privilege or object (class 42).
// A connection refused, reset or lost, and a server starting up or
// shutting down (class 57) are not.
func Refused(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	return strings.HasPrefix(pgErr.Code, "28") || pgErr.Code == "3D000" || strings.HasPrefix(pgErr.Code, "42")
}

// ParseConfig parses connString (empty: the PG* variables) into a pgx
// config. Its errors name no password.
func ParseConfig(connString string) (*pgx.ConnConfig, error) {
	cfg, err := pgx.ParseConfig(connString)
	if err != nil {
		return nil, &Error{msg: "invalid database URL: " + Scrub(err, connString), err: err}
	}
	return cfg, nil
}

// Describe names the server a config points at, without a password, as
// user@host:port/database.
func Describe(cfg *pgconn.Config) string {
	return fmt.Sprintf("%s@%s:%d/%s", cfg.User, cfg.Host, cfg.Port, cfg.Database)
}

// Connect opens one connection. The error, if any, is one line without a
// password.
func Connect(ctx context.Context, connString string) (*pgx.Conn, error) {
	return ConnectWith(ctx, connString, nil)
}

// ConnectWith is Connect with a chance to adjust the parsed config.
func ConnectWith(ctx context.Context, connString string, adjust func(*pgx.ConnConfig)) (*pgx.Conn, error) {
	cfg, err := ParseConfig(connString)
	if err != nil {
		return nil, err
	}
	if adjust != nil {
		adjust(cfg)
	}
	if cfg.ConnectTimeout == 0 {
		cfg.ConnectTimeout = 10 * time.Second
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, Wrap(err, connString, "cannot connect to PostgreSQL at "+Describe(&cfg.Config))
	}
	return conn, nil
}

// NewPool makes a pool of at most maxConns connections with pgxpool's
// other defaults, adjust (when not nil) applied to the parsed connection
// config. As with Connect, its errors are one line without a password.
func NewPool(ctx context.Context, connString string, maxConns int32, adjust func(*pgx.ConnConfig)) (*pgxpool.Pool, error) {
	connCfg, err := ParseConfig(connString)
	if err != nil {
		return nil, err
	}
	if adjust != nil {
		adjust(connCfg)
	}
	cfg, err := pgxpool.ParseConfig("")
	if err != nil {
		return nil, &Error{msg: "pool defaults: " + Scrub(err, connString), err: err}
	}
	cfg.ConnConfig = connCfg
	cfg.MaxConns = maxConns
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, Wrap(err, connString, "cannot connect to PostgreSQL at "+Describe(&connCfg.Config))
	}
	return pool, nil
}

// dedupeLines joins a multi-line message into one line, dropping repeats:
// pgx reports each connection attempt (with and without TLS) on its own
// line, and they are often the same.
func dedupeLines(msg string) string {
	seen := map[string]bool{}
	var parts []string
	for _, line := range strings.Split(msg, "\n") {
		line = strings.Join(strings.Fields(line), " ")
		if line != "" && !seen[line] {
			seen[line] = true
			parts = append(parts, line)
		}
	}
	return strings.Join(parts, " ")
}
