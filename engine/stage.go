package engine

// Stage processes a whole batch in one call. It reads and rewrites packets
// in place, sets OutPort, and marks packets it refuses with Batch.Drop. A
// stage must not allocate per packet and must not keep references to
// packets after it returns.
type Stage interface {
	Process(b *Batch)
}

// StageFunc adapts a function to a Stage.
type StageFunc func(b *Batch)

// Process calls f(b).
func (f StageFunc) Process(b *Batch) { f(b) }

// Pipeline is a fixed sequence of stages. It is immutable once built and
// may be shared by workers if every stage is safe for concurrent use.
type Pipeline struct {
	stages []Stage
}

// NewPipeline returns a pipeline running stages in order.
func NewPipeline(stages ...Stage) *Pipeline {
	return &Pipeline{stages: append([]Stage(nil), stages...)}
}

// Stages returns the pipeline's stages.
func (pl *Pipeline) Stages() []Stage { return pl.stages }

// Process runs every stage over b, removing dropped packets after each, and
// stops early when the batch becomes empty.
func (pl *Pipeline) Process(b *Batch) {
	for _, s := range pl.stages {
		if b.n == 0 {
			return
		}
		s.Process(b)
		b.Compact()
	}
}
