"""Where the session model (`python_model.py`, written as `model.py`) keeps image features:
numpy arrays, or one ONNX Runtime buffer per feature map with a slot per image (on a GPU); and
the least-recently-used map they share with the mask logits it keeps for refinement.
Written next to `model.py`; numpy and onnxruntime only.
"""

from collections import OrderedDict

import numpy as np
import onnxruntime as ort


class LruStore:
    """Least-recently-used map of at most `capacity` entries by key."""

    def __init__(self, capacity: int) -> None:
        self.capacity = max(1, capacity)
        self._items: OrderedDict = OrderedDict()

    def __contains__(self, key: str) -> bool:
        return key in self._items

    def get(self, key: str):
        """The entry of `key`, now the most recently used; KeyError if it is not kept."""
        self._items.move_to_end(key)
        return self._items[key]

    def put(self, key: str, entry) -> None:
        """Keep `entry` under `key`, evicting the least recently used beyond the capacity."""
        self._items[key] = entry
        self._items.move_to_end(key)
        while len(self._items) > self.capacity:
            self._evicted(self._items.popitem(last=False)[1])

    def _evicted(self, entry) -> None:
        pass


class FeatureStore(LruStore):
    """handle -> one image's encoder outputs as numpy arrays; a graph run on them (`run_decoder`: the
    decoder, the instance decoder, SAM3's detector) is fed those it takes."""

    def __init__(self, capacity: int, names: list) -> None:
        super().__init__(capacity)
        self.names = names

    def encode(self, handles: list, feeds: dict, encoder, options=None) -> None:
        """Run `encoder` on `feeds` (a batch: one image per handle) with run `options` and keep each
        image's outputs under its handle."""
        outputs = encoder.run(self.names, feeds, options)
        for row, handle in enumerate(handles):
            self.put(handle, {name: _row(output, row, len(handles)) for name, output in zip(self.names, outputs)})

    def host(self, entry) -> dict:
        """One entry's features as numpy arrays [1, C, H, W] by name."""
        return entry

    def run_decoder(self, decoder, wanted: list, rows: list, prompts: dict, options) -> list:
        """`decoder` on the features of `rows` (entries from `get`, one per prompt set) and `prompts`."""
        taken = _inputs(decoder)
        feeds = {name: _joined([row[name] for row in rows]) for name in self.names if name in taken}
        return decoder.run(wanted, {**feeds, **prompts}, options)


class BufferFeatureStore(FeatureStore):
    """The same map, holding features in one ONNX Runtime buffer per output ([capacity, C, H, W],
    on GPU `device_id`) with a slot per image: the encoder writes into the slot and the decoder
    reads from it, so features never travel through host memory."""

    def __init__(self, capacity: int, names: list, shapes: list, device: str, gather, device_id: int = 0) -> None:
        super().__init__(capacity, names)
        self.device, self.device_id, self.shapes, self.gather = device, device_id, dict(zip(names, shapes)), gather
        self.buffers = {
            name: ort.OrtValue.ortvalue_from_shape_and_type([self.capacity, *shape], np.float32, device, device_id)
            for name, shape in self.shapes.items()
        }
        self.free = list(range(self.capacity))
        self.encodes, self.written = 0, {}  # images encoded here; slot -> the number of the one it holds

    def _evicted(self, slot: int) -> None:
        self.free.append(slot)

    def version(self, slot: int) -> tuple:
        """What tells the features in `slot` from those it held before (slots are reused)."""
        return slot, self.written[slot]

    def slot_pointer(self, name: str, slot: int) -> int:
        """The device address of feature `name` in `slot`."""
        return self.buffers[name].data_ptr() + slot * 4 * int(np.prod(self.shapes[name]))

    def _bind(self, binding, bind, name: str, slot: int, count: int = 1) -> None:
        """Bind `name` of `count` slots from `slot` on with `bind` (an input or output binder of `binding`)."""
        bind(name, self.device, self.device_id, np.float32, [count, *self.shapes[name]], self.slot_pointer(name, slot))

    def encode(self, handles: list, feeds: dict, encoder, options=None) -> None:
        """The encoder writes each image's outputs into its slot: a batch into consecutive free
        slots, one run per stretch of them (the fewest runs the free slots allow)."""
        while len(self.free) < len(handles):
            self._evicted(self._items.popitem(last=False)[1])
        done = 0
        for first, count in _free_stretches(self.free, len(handles)):
            binding = encoder.io_binding()
            for name, array in feeds.items():
                binding.bind_cpu_input(name, np.ascontiguousarray(array[done : done + count]))
            for name in self.names:
                self._bind(binding, binding.bind_output, name, first, count)
            encoder.run_with_iobinding(binding, options)
            for offset, handle in enumerate(handles[done : done + count]):
                self.free.remove(first + offset)
                self.encodes += 1
                self.written[first + offset] = self.encodes
                self.put(handle, first + offset)
            done += count

    def host(self, slot: int) -> dict:
        return {name: value.numpy() for name, value in self._gathered([slot]).items()}

    def run_decoder(self, decoder, wanted: list, rows: list, prompts: dict, options) -> list:
        binding = self.decoder_binding(decoder, wanted, rows, prompts)
        decoder.run_with_iobinding(binding, options)
        return binding.copy_outputs_to_cpu()

    def decoder_binding(self, decoder, wanted: list, rows: list, prompts: dict):
        """`decoder`'s IO binding for `rows` (slots) and `prompts`: one row read in its slot, several
        gathered into new device buffers; `wanted` outputs to host memory. Its own step, so that
        `benchmarks.session_batch_probe` times it apart from the run."""
        binding = decoder.io_binding()
        if len(rows) == 1:
            taken = _inputs(decoder)
            for name in (name for name in self.names if name in taken):
                self._bind(binding, binding.bind_input, name, rows[0])
        else:
            for name, value in self._gathered(rows).items():
                binding.bind_ortvalue_input(name, value)
        for name, array in prompts.items():
            binding.bind_cpu_input(name, np.ascontiguousarray(array))
        for name in wanted:
            binding.bind_output(name, "cpu")
        return binding

    def _gathered(self, slots: list) -> dict:
        """The rows of `slots` side by side in new device buffers [len(slots), C, H, W] by name (of
        the features the gather graph takes: the decoder's, which alone runs on several rows)."""
        names = [name for name in self.names if f"{name}_slots" in _inputs(self.gather)]
        binding = self.gather.io_binding()
        for name in names:
            binding.bind_ortvalue_input(f"{name}_slots", self.buffers[name])
            binding.bind_output(name, self.device, self.device_id)
        binding.bind_cpu_input("rows", np.asarray(slots, np.int64))
        self.gather.run_with_iobinding(binding)
        return dict(zip(names, binding.get_outputs()))


def _row(output: np.ndarray, row: int, rows: int) -> np.ndarray:
    """One image's row [1, ...] of a batch's output: a copy of it when the batch has others (a
    view would keep the whole batch in memory until every image of it is evicted)."""
    return output if rows == 1 else output[row : row + 1].copy()


def _free_stretches(free: list, count: int) -> list:
    """(first slot, length) of stretches of consecutive `free` slots, the longest first, holding
    `count` slots in all."""
    stretches: list = []
    for slot in sorted(free):
        if stretches and sum(stretches[-1]) == slot:
            stretches[-1][1] += 1
        else:
            stretches.append([slot, 1])
    chosen = []
    for first, length in sorted(stretches, key=lambda stretch: -stretch[1]):
        if count <= 0:
            break
        chosen.append((first, min(length, count)))
        count -= length
    return chosen


def _inputs(session) -> set:
    """The input names of an ONNX Runtime session."""
    return {i.name for i in session.get_inputs()}


def _joined(arrays: list) -> np.ndarray:
    """Arrays joined along the batch axis; one array as it is (no copy)."""
    return arrays[0] if len(arrays) == 1 else np.concatenate(arrays)
