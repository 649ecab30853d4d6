package bgp

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync/atomic"

	gobgplog "github.com/osrg/gobgp/v3/pkg/log"
)

// slogLogger adapts a *slog.Logger to GoBGP's log.Logger interface.
//
// GoBGP's levels map onto slog's: Trace to Debug-4, Debug, Info, Warn and
// Error to their namesakes. Panic and Fatal, which GoBGP only uses for
// internal "code logic bug" conditions, are logged at Error and then panic
// (GoBGP's own logrus logger would exit the process on Fatal; a panic at
// least leaves a stack trace). GoBGP's fields become attributes, sorted by
// key so a record reads the same every time.
type slogLogger struct {
	l *slog.Logger
	// max is the most verbose GoBGP level allowed by SetLevel; the handler
	// can be stricter still.
	max atomic.Uint32
}

func newSlogLogger(l *slog.Logger) *slogLogger {
	s := &slogLogger{l: l}
	s.max.Store(uint32(gobgplog.TraceLevel))
	return s
}

var _ gobgplog.Logger = (*slogLogger)(nil)

// levelTrace is below slog.LevelDebug, as GoBGP's trace is below debug.
const levelTrace = slog.LevelDebug - 4

func slogLevel(l gobgplog.LogLevel) slog.Level {
	switch l {
	case gobgplog.PanicLevel, gobgplog.FatalLevel, gobgplog.ErrorLevel:
		return slog.LevelError
	case gobgplog.WarnLevel:
		return slog.LevelWarn
	case gobgplog.InfoLevel:
		return slog.LevelInfo
	case gobgplog.DebugLevel:
		return slog.LevelDebug
	default:
		return levelTrace
	}
}

func (s *slogLogger) log(l gobgplog.LogLevel, msg string, fields gobgplog.Fields) {
	if l > gobgplog.LogLevel(s.max.Load()) {
		return
	}
	ctx := context.Background()
	level := slogLevel(l)
	if !s.l.Enabled(ctx, level) {
		return
	}
	keys := make([]string, 0, len(fields))
	for k := range fields {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	attrs := make([]slog.Attr, 0, len(keys))
	for _, k := range keys {
		attrs = append(attrs, slog.Any(k, fields[k]))
	}
	s.l.LogAttrs(ctx, level, msg, attrs...)
}

func (s *slogLogger) Panic(msg string, fields gobgplog.Fields) {
	s.log(gobgplog.PanicLevel, msg, fields)
	panic(fmt.Sprintf("gobgp: %s %v", msg, fields))
}

func (s *slogLogger) Fatal(msg string, fields gobgplog.Fields) {
	s.log(gobgplog.FatalLevel, msg, fields)
	panic(fmt.Sprintf("gobgp: fatal: %s %v", msg, fields))
}

func (s *slogLogger) Error(msg string, fields gobgplog.Fields) {
	s.log(gobgplog.ErrorLevel, msg, fields)
}

func (s *slogLogger) Warn(msg string, fields gobgplog.Fields) {
	s.log(gobgplog.WarnLevel, msg, fields)
}

func (s *slogLogger) Info(msg string, fields gobgplog.Fields) {
	s.log(gobgplog.InfoLevel, msg, fields)
}

func (s *slogLogger) Debug(msg string, fields gobgplog.Fields) {
	s.log(gobgplog.DebugLevel, msg, fields)
}

// SetLevel caps GoBGP's verbosity (GoBGP's SetLogLevel API calls it).
func (s *slogLogger) SetLevel(level gobgplog.LogLevel) { s.max.Store(uint32(level)) }

// GetLevel reports the most verbose level that would be logged, so GoBGP
// skips building debug records nobody reads.
func (s *slogLogger) GetLevel() gobgplog.LogLevel {
	ctx := context.Background()
	max := gobgplog.LogLevel(s.max.Load())
	if max <= gobgplog.ErrorLevel {
		return max
	}
	for l := max; l > gobgplog.ErrorLevel; l-- {
		if s.l.Enabled(ctx, slogLevel(l)) {
			return l
		}
	}
	return gobgplog.ErrorLevel
}
