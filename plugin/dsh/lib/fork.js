/**
 * Where a conversation is cut when the user rewinds to the start of turn N.
 *
 * The child session holds the history *before turn N's user message*: every
 * event up to the `turn/end` of the last turn before N, plus the between-turn
 * events after it (titles, command runs) -- but not the inbox splice that
 * queued turn N's prompt, nor anything of turn N.  That prefix is what the
 * harness accepts as a fork seed: contiguous from seq 0, no open turn or step,
 * no dangling tool call.  Turn numbers are the harness's own: turn/start data
 * `turn`, counted per session log (a fork continues its parent's numbering).
 * @module rewindfs-dsh/fork
 */

/**
 * @param {readonly {type: string, data?: any}[]} events - the session log.
 * @param {number} turn - absolute turn number (>= 1).
 * @returns {{cut: number} | {missing: true, turns: number[]}} the seed length, or the turns that exist.
 */
export function forkCut(events, turn) {
  const start = events.findIndex((e) => e.type === 'turn/start' && e.data?.turn === turn);
  if (start < 0) return { missing: true, turns: turnsOf(events) };
  let cut = 0;
  for (let i = 0; i < start; i++) if (events[i].type === 'turn/end') cut = i + 1;
  while (cut < start && events[cut].type !== 'agent/inbox/spliced' && events[cut].type !== 'turn/start') cut++;
  return { cut };
}

/**
 * Every turn number started in the log, ascending, without repeats.
 * @param {readonly {type: string, data?: any}[]} events - the session log.
 * @returns {number[]} turn numbers.
 */
export function turnsOf(events) {
  const turns = new Set();
  for (const e of events) if (e.type === 'turn/start' && Number.isInteger(e.data?.turn)) turns.add(e.data.turn);
  return [...turns].sort((a, b) => a - b);
}

/**
 * The label of a turn: the first line of its first user message (what the store keeps).
 * @param {readonly any[]} messages - messages claimed for the turn's first step.
 * @returns {string} label, at most 200 characters.
 */
export function labelOf(messages) {
  for (const m of messages ?? []) {
    if (m?.role !== 'user' || (m.source && m.source.kind !== 'user')) continue;
    const text = (m.content ?? []).filter((b) => b?.type === 'text').map((b) => b.text).join('');
    const line = text.split('\n').find((l) => l.trim() !== '');
    if (line !== undefined) return line.trim().slice(0, 200);
  }
  return '';
}
