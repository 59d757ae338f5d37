import pytest

from wide.registry import Registry


class Base:
    pass


def test_registry_rejects_duplicates_and_wrong_base():
    reg = Registry("thing", Base)

    @reg.register("a")
    class A(Base):
        pass

    with pytest.raises(ValueError, match="already registered"):
        @reg.register("a")
        class B(Base):
            pass

    with pytest.raises(TypeError, match="does not subclass"):
        reg.register("c")(int)
    with pytest.raises(ValueError, match="field: unknown thing 'b'"):
        reg.get("b", field="field")
    assert reg.names("a*") == ["a"] and "a" in reg and len(reg) == 1
