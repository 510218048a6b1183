#include "libs/store/internal/chunk_pipeline.h"

#include <algorithm>
#include <utility>

namespace ckpt {

void ChunkPipeline::Add(int index, absl::string_view bytes, bool completes_tensor) {
  if (!writer_.joinable()) {
    const int hashers = std::clamp(static_cast<int>(std::thread::hardware_concurrency()), 1, 4);
    {
      absl::MutexLock lock(&mu_);
      hashers_running_ = hashers;
      closing_ = false;
    }
    for (int i = 0; i < hashers; ++i) hashers_.emplace_back([this] { RunHasher(); });
    writer_ = std::thread([this] { RunWriter(); });
  }
  absl::MutexLock lock(&mu_);
  pieces_.push_back(Piece{index, bytes, completes_tensor});
  ++outstanding_pieces_;
}

absl::Status ChunkPipeline::Drain() {
  if (!writer_.joinable()) return absl::OkStatus();
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](int* outstanding) { return *outstanding == 0; }, &outstanding_pieces_));
  return error_;
}

void ChunkPipeline::Cancel(absl::Status why) {
  absl::MutexLock lock(&mu_);
  if (error_.ok()) error_ = std::move(why);
}

void ChunkPipeline::Stop() {
  if (!writer_.joinable()) return;
  {
    absl::MutexLock lock(&mu_);
    closing_ = true;
  }
  for (std::thread& hasher : hashers_) hasher.join();
  hashers_.clear();
  writer_.join();
}

void ChunkPipeline::RunHasher() {
  while (true) {
    HashedChunk chunk;
    int64_t sequence = 0;
    bool failed = false;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(this, &ChunkPipeline::HasPieceOrClosing));
      if (pieces_.empty()) break;
      const Piece& piece = pieces_.front();  // never empty: Add takes none.
      chunk.index = piece.index;
      chunk.bytes = piece.bytes.substr(piece_cursor_, kChunkBytes);
      piece_cursor_ += chunk.bytes.size();
      chunk.ends_piece = piece_cursor_ >= piece.bytes.size();
      chunk.completes_tensor = chunk.ends_piece && piece.completes_tensor;
      if (chunk.ends_piece) {
        pieces_.pop_front();
        piece_cursor_ = 0;
      }
      sequence = next_hash_sequence_++;
      failed = !error_.ok();
    }
    if (!failed) chunk.digest = hash_(chunk.bytes);  // the slow part, unlocked.
    absl::MutexLock lock(&mu_);
    hashed_.emplace(sequence, std::move(chunk));
  }
  absl::MutexLock lock(&mu_);
  --hashers_running_;
}

void ChunkPipeline::RunWriter() {
  while (true) {
    HashedChunk chunk;
    bool failed = false;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(this, &ChunkPipeline::HasNextHashedOrDone));
      if (hashed_.empty()) break;
      auto next = hashed_.begin();
      chunk = std::move(next->second);
      hashed_.erase(next);
      ++next_write_sequence_;
      failed = !error_.ok();
    }
    absl::Status stored;
    if (!failed) stored = store_(chunk.index, chunk.digest, chunk.bytes, chunk.completes_tensor);
    absl::MutexLock lock(&mu_);
    if (!stored.ok() && error_.ok()) error_ = stored;
    if (chunk.ends_piece) --outstanding_pieces_;
  }
}

bool ChunkPipeline::HasPieceOrClosing() const { return !pieces_.empty() || closing_; }

bool ChunkPipeline::HasNextHashedOrDone() const {
  if (!hashed_.empty() && hashed_.begin()->first == next_write_sequence_) return true;
  return hashers_running_ == 0;
}

}  // namespace ckpt
